"""The quick-start notebook executes top to bottom, and its committed outputs (what GitHub and the docs site show,
unexecuted) are the ones it gives today: regenerate them with ``python notebooks/execute.py``."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What differs between two executions of the notebook: timings (steps/s, seconds) and the progress lines' times
TIMINGS = [(re.compile(r"[0-9.e+]+ steps/s, [0-9.]+ s"), "<steps/s>, <s>"),
           (re.compile(r"[0-9.]+s wall \([0-9.]+s compile\)"), "<wall> (<compile>)")]


def _texts(cells) -> list[str]:
    """Each code cell's text outputs joined (how the kernel splits its streams varies), with text/plain results
    but for images', timings masked."""
    texts = []
    for cell in cells:
        if cell.cell_type != "code":
            continue
        text = ""
        for output in cell.get("outputs", []):
            text += output.get("text", "")
            if output.get("output_type") == "execute_result" and len(output.get("data", {})) == 1:
                text += output["data"].get("text/plain", "")
        for pattern, mask in TIMINGS:
            text = pattern.sub(mask, text)
        texts.append(text)
    return texts


@pytest.mark.slow
def test_quickstart_notebook_executes(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(os.path.join(ROOT, "notebooks", "quickstart.ipynb"), as_version=4)
    committed = _texts(nb.cells)
    # Not a cell of the notebook (users run it as committed): the kernel keeps what it compiles in the
    # session's compilation cache (tests/conftest.py), so its repeated runs of one configuration (same key
    # twice, another key, resume) load the generation program instead of compiling it again.
    nb.cells.insert(0, nbformat.v4.new_code_cell("import jes\njes.enable_compilation_cache()"))
    # Where the kernel works and makes its temporary folders: the notebook leaves nothing behind in either (it wrote
    # cartpole.gif into the working directory and left two tempfile.mkdtemp() folders)
    cwd, temp = tmp_path / "cwd", tmp_path / "temp"
    cwd.mkdir()
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the kernel's environment is this process's
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})
    client.execute()
    assert list(cwd.iterdir()) == []
    left = [p.name for p in temp.iterdir() if p.name.startswith(("tmp", "jes-quickstart-"))]  # mkdtemp's names
    assert left == [], f"the notebook left temporary folders behind: {left}"
    outputs = "".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", []))
    assert "CartPole-v1 with adam: 8 generations" in outputs
    assert "centre return over 32 fresh episodes" in outputs
    assert "novograd    final centre return" in outputs and "pgpe        final centre return" in outputs
    assert "one episode stepped with result.act" in outputs and "same returns: True" in outputs
    assert "key 0 twice, identical parameters: True" in outputs
    assert "bit-identical to the uninterrupted run: True" in outputs
    images = [o for cell in nb.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "the learning curve shows no inline image"
    assert not any(o.get("output_type") == "error" for cell in nb.cells for o in cell.get("outputs", []))
    today = _texts(nb.cells[1:])   # but for the cache's cell
    assert committed == today, (
        "notebooks/quickstart.ipynb's committed outputs are not what it prints today; run `python notebooks/execute.py`"
        " and commit the notebook. Committed vs today's, first difference: "
        + next((f"{a!r} vs {b!r}" for a, b in zip(committed, today) if a != b), f"{len(committed)} vs {len(today)} outputs"))
