"""The quick-start notebook executes top to bottom."""
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_quickstart_notebook_executes(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(os.path.join(ROOT, "notebooks", "quickstart.ipynb"), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = "".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", []))
    assert "CartPole-v1 with adam: 8 generations" in outputs
    assert "centre return over 32 fresh episodes" in outputs
    assert "novograd  final centre return" in outputs
    assert not any(o.get("output_type") == "error" for cell in nb.cells for o in cell.get("outputs", []))
