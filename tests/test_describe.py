"""jes.describe: plain-data descriptions and the allowlist that decides what they may build."""
import dataclasses
import functools
import json
import operator
import os
import re
import subprocess
import sys

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import msgpack
import numpy as np
import pytest

import jes
from jes import describe
from jes.describe import DescriptionError, RefusedError
from jes.distributed import protocol

CONFIG = jes.ESConfig(num_members=8, chunk_size=4, eval_episodes=2)


def popen(path) -> dict:
    """A description that, if built, runs ``touch path``."""
    return {"class": "subprocess:Popen", "fields": {"args": {"__seq__": ["touch", str(path)], "tuple": False}}}


def base_description():
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(3,)), "CartPole-v1", "adam", CONFIG)
    return msgpack.unpackb(msgpack.packb(protocol.describe_run(trainer, "CartPole-v1", "adam")))


def rce_routes(target) -> dict:
    """The five routes a fake master used to make a worker run subprocess.Popen (issue 11)."""
    base = base_description()
    aliased = dict(popen(target), **{"class": "jax._src.environment_info:subprocess.Popen"})
    nested = dict(base["policy"], fields=dict(base["policy"]["fields"], activation=popen(target)))
    return {
        "policy": dict(base, policy=popen(target)),
        "env": dict(base, env=popen(target)),
        "env_params": dict(base, env_params=popen(target)),
        "nested config field": dict(base, config=dict(base["config"], noise_std=popen(target))),
        "nested policy field": dict(base, policy=nested),
        "allowed-looking path": dict(base, policy=aliased),
    }


@pytest.mark.parametrize("route", ["policy", "env", "env_params", "nested config field", "nested policy field",
                                   "allowed-looking path"])
def test_every_rce_route_is_refused_and_creates_nothing(route, tmp_path):
    target = tmp_path / "pwned"
    with pytest.raises(RefusedError):
        protocol.build_run(rce_routes(target)[route])
    assert not target.exists()


def test_an_alias_inside_an_allowed_module_is_refused_by_its_defining_module(monkeypatch, tmp_path):
    import envs_for_tests

    monkeypatch.setattr(envs_for_tests, "sneaky", subprocess.Popen, raising=False)
    monkeypatch.setattr(envs_for_tests, "sneaky_function", os.system, raising=False)
    allow = describe.allowlist(["envs_for_tests"])
    with pytest.raises(RefusedError, match="defined in 'subprocess'"):
        describe.build_value(dict(popen(tmp_path / "x"), **{"class": "envs_for_tests:sneaky"}), allow)
    with pytest.raises(RefusedError, match="defined in 'posix'"):
        describe.build_value({"__callable__": "envs_for_tests:sneaky_function"}, allow)
    assert not (tmp_path / "x").exists()


def test_allowlist_is_checked_on_the_resolved_object_not_the_path():
    allow = describe.allowlist(["envs_for_tests"])
    for path, match in (
        ("jax._src.environment_info:subprocess.Popen", "not one of jes's registered"),
        ("jax:numpy", "not one of jes's registered"),
        ("jes.describe:importlib.import_module", "not one of jes's registered"),
        ("envs_for_tests:environment.Environment", "walks into the module"),
        ("envs_for_tests:Countdown.__init__.__globals__", "dunder"),
        ("gymnax.environments.environment:Environment.__subclasses__", "dunder"),
        ("os:system", "outside the allowed"),
        ("builtins:eval", "outside the allowed"),
        ("mypkg.policies:Policy", "outside the allowed"),
        ("envs_for_tests.__main__:main", "dunder or malformed module"),  # imported (and run) before, then refused
        ("envs_for_tests.__init__:Countdown", "dunder or malformed module"),
    ):
        with pytest.raises(RefusedError, match=match):
            describe.resolve(path, allow, "x")
    for bad in ("subprocess", "flax", "flax.linen", "jax.numpy", "brax.io"):
        with pytest.raises(ValueError, match="never built|is a library"):
            describe.allowlist([bad])
    with pytest.raises(ValueError, match="dotted module name"):
        describe.allowlist(["my pkg"])


def gadgets(target) -> dict:
    """Allowed-package objects that call what a description gives them (issue 27's routes and kin)."""
    save = {"__callable__": "brax.io.model:save_params"}
    return {
        "ToLinen(save_params)": {"class": "flax.nnx.bridge.wrappers:ToLinen", "fields": {
            "nnx_class": save, "args": {"__seq__": [str(target), {"__seq__": [], "tuple": False}], "tuple": True}}},
        "functools.partial": {"class": "functools:partial", "fields": {}},
        "jax Partial": {"class": "jax._src.tree_util:Partial", "fields": {}},
        "flax Module base": {"class": "flax.linen.module:Module", "fields": {}},
        "any jes dataclass": {"class": "jes.config:ESConfig", "fields": {}},
        "an unregistered function field": {"class": "jes.policies:MLPPolicy", "fields": {"activation": save}},
        "a jax function that runs host callbacks": {"class": "jes.policies:MLPPolicy", "fields": {
            "activation": {"__callable__": "jax.experimental:io_callback"}}},
        "gymnax env module helper": {"class": "gymnax.environments.environment:jax", "fields": {}},
    }


@pytest.mark.parametrize("name", list(gadgets("x")))
def test_library_gadgets_are_not_in_the_registry_and_create_nothing(name, tmp_path):
    target = tmp_path / "written"
    with pytest.raises(RefusedError):
        describe.build_value(gadgets(target)[name], describe.allowlist(), role="policy")
    with pytest.raises(RefusedError):
        protocol.build_run(dict(base_description(), policy=gadgets(target)[name]))
    assert not target.exists()


def nnx_gadgets(target) -> dict:
    """What a crafted file could try with the ToLinen that nnx policies bring (a review's routes): each must build
    nothing. ``policies_for_tests`` is imported (its nnx class and its linen classes are the user's own)."""
    nnx_class = {"__nnx_class__": "policies_for_tests:NnxMLP"}
    save = {"__callable__": "brax.io.model:save_params"}
    to_linen = lambda **fields: {"class": "flax.nnx.bridge.wrappers:ToLinen", "fields": fields}  # noqa: E731
    written = {"__seq__": [str(target), {"__seq__": [], "tuple": False}], "tuple": True}
    return {
        # a mixed value: the allowlist read the nnx class, the builder a sequence; the admitted class then built
        # elsewhere with the file's fields
        "mixed nnx_class": to_linen(nnx_class={"__seq__": [], "__nnx_class__": "policies_for_tests:SwishPolicy"},
                                    args={"__seq__": [{"class": "policies_for_tests:SwishPolicy", "fields": {}}],
                                          "tuple": True}),
        "a function as nnx_class": to_linen(nnx_class=save, args=written),
        "a registered function as nnx_class": to_linen(nnx_class={"__callable__": "jax.nn:relu"}),
        "a linen class as nnx_class": to_linen(nnx_class={"__nnx_class__": "policies_for_tests:SwishPolicy"}),
        "a library's nnx class": to_linen(nnx_class={"__nnx_class__": "flax.nnx.nn.linear:Linear"}, args=written),
        "extra keys beside the class": to_linen(nnx_class=dict(nnx_class, tuple=True)),
        "kwargs not a mapping": to_linen(nnx_class=nnx_class, kwargs={"__seq__": [], "tuple": True}),
        "a mapping with another form": to_linen(nnx_class=nnx_class, kwargs={"__mapping__": {}, "class": "x:y"}),
        "ToLinen inside a policy": {"class": "jes.policies:MLPPolicy", "fields": {
            "activation": to_linen(nnx_class=nnx_class, args={"__seq__": [2], "tuple": True})}},
        "an nnx class outside ToLinen": {"class": "jes.policies:MLPPolicy", "fields": {"activation": nnx_class}},
    }


@pytest.mark.parametrize("name", list(nnx_gadgets("x")))
def test_a_toLinen_is_built_only_around_an_nnx_class_of_the_users_own_named_as_one(name, tmp_path):
    import policies_for_tests  # noqa: F401 - imported, as a program that trained with it has

    target = tmp_path / "written"
    description = nnx_gadgets(target)[name]
    with pytest.raises(jes.checkpoint.CheckpointError, match="cannot rebuild the policy"):
        jes.checkpoint.build_policy(description, "crafted.policy", checkpoint=False)
    with pytest.raises(describe.DescriptionError):
        describe.build_value(description, describe.allowlist(["policies_for_tests"]), role="policy")
    assert not target.exists()
    good = {"class": "flax.nnx.bridge.wrappers:ToLinen", "fields": {
        "nnx_class": {"__nnx_class__": "policies_for_tests:NnxMLP"}, "args": {"__seq__": [2], "tuple": True},
        "kwargs": {"__mapping__": {"features": 3}}}}
    built = jes.checkpoint.build_policy(good, "good.policy", checkpoint=False)
    assert built.nnx_class is policies_for_tests.NnxMLP and built.kwargs == {"features": 3}


def test_registered_objects_are_the_policy_layers_strategies_and_activations():
    classes, functions = describe.registered_classes(), describe.registered_callables()
    for cls in (jes.GRUPolicy, jes.MLPPolicy, nn.Dense, nn.Conv, nn.GRUCell, nn.LSTMCell, nn.Embed, nn.Sequential):
        assert cls in classes.values()
    for fn in (jnp.tanh, jax.nn.relu, jax.nn.gelu, jnp.float32):
        assert fn in functions.values()
    assert not any(getattr(c, "__name__", "") in ("ToLinen", "Partial", "partial", "Module") for c in classes.values())
    policy = nn.Sequential([nn.Dense(4), jax.nn.relu, nn.Dense(2)])
    rebuilt = describe.build_object(json.loads(json.dumps(describe.describe_object(policy, "policy"))),
                                    describe.allowlist(), role="policy")
    assert rebuilt.layers[1] is jax.nn.relu and rebuilt.layers[0].features == 4


def test_wrong_kinds_are_refused():
    allow = describe.allowlist(["envs_for_tests"])
    with pytest.raises(RefusedError, match="not a class"):
        describe.build_object({"class": "envs_for_tests:make_countdown", "fields": {}}, allow)
    with pytest.raises(RefusedError, match="flax.linen.Module"):
        describe.build_object({"class": "jes.strategies.pgpe:PGPE", "fields": {}}, allow, role="policy")
    with pytest.raises(RefusedError, match="not a dataclass"):
        describe.build_object({"class": "envs_for_tests:Countdown", "fields": {}}, allow)
    with pytest.raises(RefusedError, match="not a function"):
        describe.build_value({"__callable__": "envs_for_tests:Countdown"}, allow)


def test_nothing_is_built_when_a_later_part_is_refused(tmp_path, monkeypatch):
    description = dict(base_description(), env_params=popen(tmp_path / "x"))
    built, post_init = [], jes.MLPPolicy.__post_init__

    def record(self):
        built.append(self)
        post_init(self)

    monkeypatch.setattr(jes.MLPPolicy, "__post_init__", record)
    with pytest.raises(RefusedError):
        protocol.build_run(description)
    assert built == []
    protocol.build_run(base_description())
    assert built  # the recorder does see a build


def test_user_modules_need_allow_modules():
    description = base_description()
    description["policy"] = {"class": "envs_for_tests:Countdown", "fields": {}}
    with pytest.raises(RefusedError, match="allow_modules"):
        protocol.build_run(description)
    # Allowed, but a Countdown env is no policy.
    with pytest.raises(RefusedError, match="flax.linen.Module"):
        protocol.build_run(description, allow=describe.allowlist(["envs_for_tests"]))
    env_description = dict(base_description(), env={"class": "envs_for_tests:Countdown", "fields": {}})
    trainer = protocol.build_run(env_description, allow=describe.allowlist(["envs_for_tests"]))
    assert type(trainer.spec.env).__name__ == "Countdown"


def test_only_a_refusal_that_opting_a_module_in_can_mend_is_a_not_allowed_error():
    """Callers add "allow its module" advice to NotAllowedError alone: a registered class refusing its fields or a
    class of the wrong role is no matter of the allowlist, nor is a library's or a denied module's class."""
    allow = describe.allowlist()
    with pytest.raises(describe.NotAllowedError) as raised:
        describe.build_object({"class": "envs_for_tests:Countdown", "fields": {}}, allow)
    assert raised.value.module == "envs_for_tests" and raised.value.can_opt_in
    for path in ("flax.linen:ToLinen", "subprocess:Popen"):
        with pytest.raises(describe.NotAllowedError) as raised:
            describe.build_object({"class": path, "fields": {}}, allow, role="policy")
        assert not raised.value.can_opt_in, path
    with pytest.raises(RefusedError, match="flax.linen.Module") as raised:
        describe.build_object({"class": "jes.strategies.pgpe:PGPE", "fields": {}}, allow, role="policy")
    assert not isinstance(raised.value, describe.NotAllowedError)
    with pytest.raises(DescriptionError, match=r"MLPPolicy\(\.\.\.\) failed: AssertionError$") as raised:
        describe.build_object({"class": "jes.policies:MLPPolicy",
                               "fields": {"parent": {"class": "flax.linen:Dense", "fields": {"features": 2}}}},
                              allow, role="policy")
    assert not isinstance(raised.value, RefusedError)


def test_malformed_descriptions_are_description_errors():
    base = base_description()
    cartpole_params = gymnax.make("CartPole-v1")[1]
    for bad in (
        None, [], {}, dict(base, version=99), dict(base, policy="x"), dict(base, policy={"class": 5}),
        dict(base, optimizer=3), dict(base, optimizer="no-such-optimizer"), dict(base, config={"num_members": -1}),
        dict(base, config={"nope": 1}), dict(base, env="NoSuchEnv-v0"), dict(base, env_params=5),
        dict(base, env_params={"class": "jes.config:ESConfig", "fields": {}}),   # a dataclass, not EnvParams
        dict(base, env="Pendulum-v1", env_params=describe.describe_object(cartpole_params, "p")),
        dict(base, policy=dict(base["policy"], fields={"unknown_field": 1})),
        dict(base, config=dict(base["config"], noise_std={"__weird__": 1})),
    ):
        with pytest.raises(DescriptionError):
            protocol.build_run(bad)


@dataclasses.dataclass(frozen=True)
class _Nested:
    rate: float = 0.5
    sizes: tuple = (1, 2)


def test_descriptions_round_trip_through_json_and_keep_tuples():
    policy = jes.MLPPolicy(hidden_sizes=(5, 3), activation=jnp.tanh)
    description = json.loads(json.dumps(describe.describe_object(policy, "policy")))
    assert describe.build_object(description, describe.allowlist(), role="policy") == policy
    value = describe.describe_value(_Nested(), "strategy")  # a dataclass, as a strategy will be
    assert value["class"] == f"{__name__}:_Nested"
    assert describe.build_value(value, describe.allowlist([__name__])) == _Nested()


def test_lenient_description_records_what_cannot_travel():
    policy = jes.MLPPolicy(hidden_sizes=(3,), activation=lambda x: x)
    with pytest.raises(DescriptionError, match="lambda"):
        describe.describe_object(policy, "policy")
    recorded = describe.describe_object(policy, "policy", lenient=True)
    assert "__unimportable__" in recorded["fields"]["activation"]
    with pytest.raises(DescriptionError, match="cannot be rebuilt"):
        describe.build_object(recorded, describe.allowlist(), role="policy")


def _scaled(scale):
    return lambda x: x * scale


class _Opaque:
    pass


def test_a_lambda_is_recorded_by_module_qualified_name_and_line_not_its_address():
    """A lambda was recorded by its repr, memory address included, so no other process matched its checkpoint."""
    swish = lambda x: x * nn.sigmoid(x)  # noqa: E731
    line = swish.__code__.co_firstlineno
    recorded = describe.describe_value(swish, "policy.activation", lenient=True)
    assert recorded == {"__unimportable__": f"{__name__}:test_a_lambda_is_recorded_by_module_qualified_name_and_line_"
                                            f"not_its_address.<locals>.<lambda>:{line} "
                                            f"code={describe.code_hash(swish.__code__)}"}
    assert describe.unstable_fields({"class": "c", "fields": {"activation": recorded}}) == []
    # a closure: with the plain data it closes over, so another scale is another function
    line = _scaled.__code__.co_firstlineno + 1
    code = describe.code_hash(_scaled(2.0).__code__)
    assert describe.code_name(_scaled(2.0)) == \
        f"{__name__}:_scaled.<locals>.<lambda>:{line} code={code} closing over [2.0, {{}}]"
    assert describe.code_name(_scaled(2.0)) != describe.code_name(_scaled(3.0))
    assert describe.code_name(functools.partial(nn.leaky_relu, negative_slope=0.1)) == \
        'functools.partial(flax.linen.activation:leaky_relu, [{"negative_slope": 0.1}])'.replace(
            "flax.linen.activation:leaky_relu", describe._path_of(nn.leaky_relu))
    # what it closes over is an object: its repr holds an address, and the description says where
    assert describe.code_name(_scaled(_Opaque())) is None
    recorded = describe.describe_object(jes.MLPPolicy(activation=_scaled(_Opaque())), "policy", lenient=True)
    assert [f.split(" (")[0] for f in describe.unstable_fields(recorded)] == ["policy.activation"]


@pytest.mark.parametrize("value, recorded", [
    (functools.partial(operator.mul, 0.5), "functools.partial(<built-in function mul>, 0.5)"),
    (functools.partial(nn.Dense, 4), "functools.partial(<class 'flax.linen.linear.Dense'>, 4)"),
    (functools.partial(np.maximum, 0.0), "functools.partial(<ufunc 'maximum'>, 0.0)"),
])
def test_a_value_whose_repr_was_already_stable_is_recorded_as_before(value, recorded):
    """Naming lambdas by code changed partials of builtins, classes and ufuncs too, whose repr already matched in
    every process: their old checkpoints were refused on resume. Only a repr holding an address is replaced."""
    assert describe.describe_value(value, "policy.activation", lenient=True) == {"__unimportable__": recorded}


def test_an_edited_lambda_on_the_same_line_is_recorded_otherwise():
    """Module, qualified name, line and captured data were all that was recorded: a lambda edited on its line resumed
    silently. Its code's hash tells it; the same code elsewhere hashes the same (a moved lambda is the same)."""
    a, b = (lambda x: x * 2.0), (lambda x: x * 3.0)  # noqa: E731 - one line, one qualified name
    c = (
        lambda x: x * 2.0)  # noqa: E731
    assert describe.code_name(a) != describe.code_name(b)
    assert describe.code_hash(a.__code__) == describe.code_hash(c.__code__)
    assert describe.code_hash(a.__code__) != describe.code_hash(b.__code__)
    # a function defined inside it: its code counts too
    outer1, outer2 = (lambda x: (lambda y: y + 1)(x)), (lambda x: (lambda y: y - 1)(x))  # noqa: E731
    assert describe.code_hash(outer1.__code__) != describe.code_hash(outer2.__code__)
    assert len(describe.code_hash(a.__code__)) == 12


CODE_HASH = """
from jes import describe
f = lambda x: x in {"alpha", "beta", "gamma", "delta"} or x in frozenset({1, 2})
print(describe.code_hash(f.__code__))
"""


def test_a_code_hash_is_the_same_in_processes_with_other_string_hashing():
    """A set constant (``x in {"a", "b"}``) is a frozenset whose order follows PYTHONHASHSEED."""
    hashes = set()
    for seed in ("1", "2", "3"):
        out = subprocess.run([sys.executable, "-c", CODE_HASH], capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, PYTHONHASHSEED=seed))
        assert out.returncode == 0, out.stderr[-2000:]
        hashes.add(out.stdout.strip())
    assert len(hashes) == 1, hashes


def test_long_captured_data_is_recorded_by_its_hash():
    """A lambda closing over a 200k-element list was recorded as a 1 MB description, echoed in every error."""
    table = [0.5] * 200_000
    name = describe.code_name(_scaled(table))
    assert len(name) < 250 and re.search(r" closing over sha256:[0-9a-f]{64}$", name), name
    assert name == describe.code_name(_scaled(list(table)))
    assert name != describe.code_name(_scaled([0.5] * 199_999))
    assert describe.code_name(_scaled("a" * 150)).endswith('closing over ["' + "a" * 150 + '", {}]')  # short: as is


def test_a_description_nested_past_the_limit_is_malformed_not_a_recursion_error():
    deep = 1
    for _ in range(400):
        deep = {"__seq__": [deep], "tuple": True}
    with pytest.raises(DescriptionError, match=f"nested deeper than {describe.MAX_DEPTH} levels"):
        describe.build_value(deep, describe.allowlist(), "policy.fields.x")
    shallow = 1
    for _ in range(describe.MAX_DEPTH - 1):
        shallow = {"__seq__": [shallow], "tuple": True}
    assert describe.build_value(shallow, describe.allowlist()) is not None


def test_an_allowed_packages_dunder_module_is_refused_before_it_is_imported(tmp_path, monkeypatch):
    """``mypkg.__main__:x`` under allow_modules=["mypkg"] imported (ran) the package's __main__.py, then refused."""
    package = tmp_path / "jes_dunder_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    marker = tmp_path / "ran"
    (package / "__main__.py").write_text(f"open({str(marker)!r}, 'w').close()\nmain = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    allow = describe.allowlist(["jes_dunder_pkg"])
    for path in ("jes_dunder_pkg.__main__:main", "jes_dunder_pkg.__init__:anything"):
        with pytest.raises(RefusedError, match="dunder or malformed module"):
            describe.resolve(path, allow, "policy")
    assert not marker.exists()
    assert "jes_dunder_pkg.__main__" not in sys.modules


def test_a_gymnax_env_params_tuple_travels_as_the_env_and_its_params():
    """Fleet tester: jes.train(policy, (env, params), ..., master=...) was refused ("not as a tuple") although the
    envs guide lists (env, env_params) as an env; it describes as the env object with env_params=."""
    import gymnax

    from jes.describe import describe_run

    env, params = gymnax.make("Pendulum-v1")
    params = params.replace(g=5.0)
    policy, config = jes.MLPPolicy((4,)), jes.ESConfig(num_members=8)
    assert describe_run(policy, config, (env, params), "adam") == describe_run(policy, config, env, "adam", params)
    with pytest.raises(DescriptionError, match=r"or as \(env, params\) without env_params="):
        describe_run(policy, config, (env, params), "adam", params)


def test_an_env_object_in_a_tuple_is_checked_as_one_given_alone():
    """Review: an (env, params) tuple skipped the check that refuses env objects whose attributes no constructor
    call rebuilds, so workers would have stepped Catch() for the master's Catch(rows=7, columns=4)."""
    from gymnax.environments.bsuite.catch import Catch

    env = Catch(rows=7, columns=4)
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(3,)), (env, env.default_params), "adam", CONFIG)
    for given in (dict(env=env, env_params=env.default_params), dict(env=(env, env.default_params))):
        with pytest.raises(DescriptionError, match="Catch"):
            protocol.describe_run(trainer, optimizer="adam", **given)
