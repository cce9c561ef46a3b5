"""``python -m rlfb ...``: the ``rlfb`` console script, where the script is not on ``PATH``."""

from __future__ import annotations

if __name__ == "__main__":
    from rlfb.cli import console

    console()
