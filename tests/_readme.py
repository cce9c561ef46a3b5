"""The README's Python examples, read by ``tests/test_readme.py`` (each runs) and by ``make lint`` (each
type-checks as a user's own code: ``mypy --strict``), which writes them out with

    python tests/_readme.py DIR     # DIR/example_<n>.py, one per block, the folder's older ones removed
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS: list[str] = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def write_examples(folder: Path) -> list[Path]:
    """Write each block to ``folder/example_<n>.py``; return the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("example_*.py"):
        old.unlink()
    paths = [folder / f"example_{n}.py" for n in range(len(BLOCKS))]
    for path, block in zip(paths, BLOCKS, strict=True):
        path.write_text(block, encoding="utf-8")
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/_readme.py DIR")
    for p in write_examples(Path(sys.argv[1])):
        print(p)
