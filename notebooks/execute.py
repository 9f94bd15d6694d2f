"""Execute notebooks/quickstart.ipynb top to bottom and write its outputs back into it (what users see on GitHub
and on the docs site, which shows the committed outputs without running them):

    python notebooks/execute.py

tests/test_notebook.py runs the notebook again and checks its committed outputs are the ones it gives today (up to
timings)."""
import os
import sys

import nbclient
import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "quickstart.ipynb")


def main() -> int:
    nb = nbformat.read(PATH, as_version=4)
    workdir = os.path.join(HERE, ".execute")   # the kernel's working directory (the notebook writes nothing there)
    os.makedirs(workdir, exist_ok=True)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": workdir}}).execute()
    errors = [o for cell in nb.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if errors:
        print(f"{PATH}: a cell raised {errors[0].get('ename')}: {errors[0].get('evalue')}; not written",
              file=sys.stderr)
        return 1
    nbformat.write(nb, PATH)
    print(f"wrote {PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
