"""Inspection speed and memory: a generated X12 interchange of 100,000 transaction sets
(about 100 MB) read by the ``x12`` inspector in a process of its own.

    .venv/bin/python bench/edi_inspect.py [SETS]

prints MB/s and the process's peak RSS (VmHWM, which unlike ru_maxrss is not inherited
from the process that started it), before and after the read.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_edi_inspect import CHILD, write_big_x12  # noqa: E402


def main() -> None:
    sets = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.edi"
        size = write_big_x12(path, sets)
        out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(ROOT)],
                             check=True, capture_output=True, text=True).stdout
    result = json.loads(out)
    print(f"{size / 1e6:.1f} MB, {result['sets']} sets in {result['seconds']:.2f} s: "
          f"{size / 1e6 / result['seconds']:.0f} MB/s; peak RSS {result['peak_kb'] / 1024:.1f}"
          f" MB (the interpreter and the hub's imports included); errors {result['errors']}")


if __name__ == "__main__":
    main()
