"""What to install, said once: the extras per backend and the hints that import errors print.

npu-liger is installed from a clone (``pip install -e '.[<extra>]'``); torch comes first, from the index that
matches the machine (README "Install")."""

from __future__ import annotations

# The extra that brings the `triton` module for each backend (triton-ascend and community triton both install
# `triton`, so triton cannot be a hard dependency).
BACKEND_EXTRAS = (
    ("CPU (the Triton interpreter)", "cpu"),
    ("CUDA GPU (community triton)", "gpu"),
    ("Ascend NPU (torch-npu, triton-ascend)", "npu"),
)


def backend_install_hint() -> str:
    lines = [f"  {backend}: pip install -e '.[{extra}]'" for backend, extra in BACKEND_EXTRAS]
    return ("Install the extra for your backend from the npu-liger checkout, after installing torch for the "
            "machine (README, 'Install'):\n" + "\n".join(lines))


def require_triton() -> None:
    """Import triton, or raise an ImportError that says which extra provides it."""
    try:
        import triton  # noqa: F401
    except ModuleNotFoundError as error:
        if error.name is not None and error.name.split(".")[0] != "triton":
            raise  # triton is there but one of its own dependencies is missing: that message is the useful one
        raise ImportError("npu_liger needs the `triton` module, which is not installed.\n"
                          + backend_install_hint()) from error


TRANSFORMERS_HINT = ("npu_liger.transformers patches Hugging Face transformers models, which is not installed: "
                     "pip install 'transformers>=4.56' (or, from the npu-liger checkout, pip install -e '.[hf]')")
