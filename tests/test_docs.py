"""The documentation site builds with ``mkdocs build --strict``, and every ```python block of docs/**/*.md runs.

A page's blocks run in order in one namespace (a later block may use an earlier one's names), in the test's
temporary working directory. A block preceded by ``<!-- skip: why -->`` is not run: only for what cannot run
in a test (several machines, a GPU, the brax extra, a long training). ```bash blocks are never run.
"""
import glob
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```\s*$", re.S | re.M)
SKIP = re.compile(r"<!--\s*skip:\s*(.+?)\s*-->\s*$")


def python_blocks(path: str) -> list[tuple[int, str, str | None]]:
    """``(line, code, skip reason or None)`` for every ```python fence of a markdown file."""
    text = open(path, encoding="utf-8").read()
    blocks = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        blocks.append((text.count("\n", 0, match.start()) + 1, match.group(1), skip.group(1) if skip else None))
    return blocks


PAGES = sorted(os.path.relpath(p, DOCS) for p in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))
API_PAGE = os.path.join(DOCS, "api.md")
# Named in the guides for users to import, call or catch, beyond jes.__all__: each needs an API entry too.
GUIDE_NAMES = ("jes.host_rollout.HostEnvError", "jes.envs.gymnasium.make", "jes.envs.gymnasium.GymnasiumEnv",
               "jes.policies.matvec", "jes.checkpoint.CheckpointError", "jes.trained.PolicyFileError",
               "jes.distributed.DistributedSetupError", "jes.cpu.gpu_compiler_options",
               "jes.describe.registered_classes", "jes.describe.registered_callables", "jes.plot.plot_runs",
               "jes.render.render", "jes.logging.read_scalars", "jes.sweep.SweepRun", "jes.bounds.to_box")


def api_entries() -> list[str]:
    """The dotted paths of docs/api.md's ``::: path`` entries, in page order."""
    return re.findall(r"^::: (\S+)", open(API_PAGE, encoding="utf-8").read(), re.M)


def resolve(path: str):
    """The module or object a dotted path names."""
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as err:
        if err.name != path:
            raise
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_snippet_finder_sees_fences_and_skip_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n\n```python\nx = 1\n```\n\n<!-- skip: needs a cluster -->\n```python\ny = 2\n```\n"
                    "```bash\nls\n```\n")
    assert python_blocks(str(page)) == [(3, "x = 1\n", None), (8, "y = 2\n", "needs a cluster")]


def test_every_page_has_been_found():
    assert "index.md" in PAGES and "getting-started.md" in PAGES and "api.md" in PAGES
    blocks = [b for p in PAGES for b in python_blocks(os.path.join(DOCS, p))]
    assert len(blocks) >= 20
    skipped = [b for b in blocks if b[2]]
    # (two of them: spawn pools, whose functions must live in an importable module, not an exec-ed snippet)
    assert len(skipped) <= 5, f"skip markers are for what cannot run in a test, not {len(skipped)} blocks"


def test_the_api_page_has_an_entry_for_every_public_name():
    """Every name of jes.__all__ (for a submodule: an entry inside it) and every name the guides tell users to import
    or catch has a ``::: path`` entry on docs/api.md whose path names that very object (where it is defined, or a
    package re-exporting it)."""
    import jes

    paths = api_entries()
    documented = {id(resolve(path)) for path in paths}
    missing = []
    for name in jes.__all__:
        obj = getattr(jes, name)
        if inspect.ismodule(obj):
            if not any(p == obj.__name__ or p.startswith(obj.__name__ + ".") for p in paths):
                missing.append(f"jes.{name} (a module: no entry inside it)")
        elif id(obj) not in documented:
            missing.append(f"jes.{name}")
    missing += [path for path in GUIDE_NAMES if id(resolve(path)) not in documented]
    assert not missing, (f"public names with no entry on docs/api.md: {', '.join(missing)}; add `::: module.Name` "
                         f"(where it is defined) to its section")


@pytest.mark.hard_timeout(240)
@pytest.mark.parametrize("page", [p for p in PAGES if any(not skip for _, _, skip in python_blocks(os.path.join(DOCS, p)))])
def test_snippets_run(page):
    namespace = {"__name__": f"docs_{page.replace('/', '_').removesuffix('.md')}"}
    ran = 0
    for line, code, skip in python_blocks(os.path.join(DOCS, page)):
        if skip:
            continue
        try:
            exec(compile(code, f"docs/{page}:{line}", "exec"), namespace)
        except Exception as err:
            raise AssertionError(f"the ```python block at docs/{page}:{line} failed: {err!r}") from err
        ran += 1
    assert ran


@pytest.mark.hard_timeout(240)
def test_mkdocs_build_strict(tmp_path):
    missing = [m for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "mkdocs_jupyter")
               if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the docs extra is not installed ({', '.join(missing)}): pip install '.[docs]'")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", os.path.join(ROOT, "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True, env=env, timeout=220)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert api.count("jes.loop.train") >= 1
    ids = set(re.findall(r'id="(jes\.[^"]+)"', api))
    unrendered = [path for path in api_entries() if path not in ids]
    assert not unrendered, f"api.md entries with no heading on the built page: {unrendered}"
    roles = re.findall(r":(?:func|class|meth|data|attr|mod|exc):<code>", api)
    assert not roles, f"Sphinx roles shown as text on the API page: {len(roles)}"
    assert (tmp_path / "site" / "notebooks" / "quickstart" / "index.html").exists()


def _benchmarks_page_module():
    spec = importlib.util.spec_from_file_location("docs_page", os.path.join(ROOT, "benchmarks", "docs_page.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmarks_page_is_generated_from_the_benchmarks_readme():
    page = _benchmarks_page_module()
    with open(page.README, encoding="utf-8") as f:
        expected = page.render(f.read())
    with open(page.PAGE, encoding="utf-8") as f:
        assert f.read() == expected, "docs/benchmarks.md is stale: edit benchmarks/README.md, then run " \
                                     "python benchmarks/docs_page.py"


def test_benchmarks_page_links_resolve_from_docs_or_the_generator_says_which_do_not():
    page = _benchmarks_page_module()
    assert page.render("see [the guide](../docs/guides/x.md) and ![plot](../docs/images/p.png), [a](#b), "
                       "[c](https://example.org/d)") == page.HEADER + \
        "see [the guide](guides/x.md) and ![plot](images/p.png), [a](#b), [c](https://example.org/d)"
    with pytest.raises(ValueError, match=r"'throughput\.py'.*\.\./docs/<page>\.md"):
        page.render("the [script](throughput.py)")
