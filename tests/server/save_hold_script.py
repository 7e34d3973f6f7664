"""Run by test_sigterm_save.py in a fresh process: `ninfer ARGS` (the real command line) whose
prefix cache save holds for a while after its temporary file is written, so that a test can
signal the process while the save runs. It prints "save holding" to stderr when the hold
begins, and the hold ends early once the save is abandoned.

    python save_hold_script.py serve --prefix-cache-file FILE ...
"""

from __future__ import annotations

import sys
import time

from ninfer.cli.main import main
from ninfer.persist import payload

HOLD_S = 3.0


def main_with_a_held_save() -> int:
    write_payload = payload.write_payload

    def held(f, slabs, sources, abandoned, *rest):
        print("save holding", file=sys.stderr, flush=True)
        deadline = time.monotonic() + HOLD_S
        while time.monotonic() < deadline and not abandoned():
            time.sleep(0.02)
        return write_payload(f, slabs, sources, abandoned, *rest)

    payload.write_payload = held
    return main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main_with_a_held_save())
