"""The headless Chromium the browser tests drive (Debian's `chromium`, or $GPTPORT_CHROMIUM), and its flags."""

from __future__ import annotations

import os
import shutil

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def chromium_path() -> str | None:
    """$GPTPORT_CHROMIUM, else `chromium` on the PATH."""
    return os.environ.get("GPTPORT_CHROMIUM") or shutil.which("chromium")
