"""A user's script that never ends on its own: writes its pid to <dir>/rank<RANK>.pid, then sleeps."""

import os
import sys
import time
from pathlib import Path

folder = Path(sys.argv[1])
(folder / f"rank{os.environ['RANK']}.pid.partial").write_text(str(os.getpid()))
(folder / f"rank{os.environ['RANK']}.pid.partial").rename(folder / f"rank{os.environ['RANK']}.pid")
while True:
    time.sleep(0.2)
