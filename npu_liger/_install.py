"""What to install, said once: the extras per backend and the hints that import errors print.

npu-liger is installed from a clone (``pip install -e '.[<extra>]'``) or from a wheel built from one; torch comes
first, from the index that matches the machine (README "Install"). An installed npu-liger gets an extra's packages
with ``pip install 'npu-liger[<extra>]'``: pip reads the extra from the installed package's metadata."""

from __future__ import annotations

# The extra that brings the `triton` module for each backend (triton-ascend and community triton both install
# `triton`, so triton cannot be a hard dependency).
BACKEND_EXTRAS = (
    ("CPU (the Triton interpreter)", "cpu"),
    ("CUDA GPU (community triton)", "gpu"),
    ("Ascend NPU (torch-npu, triton-ascend)", "npu"),
)


def backend_install_hint() -> str:
    width = max(len(backend) for backend, _ in BACKEND_EXTRAS)
    lines = [f"  {backend + ':':<{width + 1}} pip install -e '.[{extra}]'   (installed from a wheel: pip install "
             f"'npu-liger[{extra}]')" for backend, extra in BACKEND_EXTRAS]
    return ("Install the extra for your backend, after torch for the machine (README, 'Install'): in the npu-liger "
            "checkout with pip install -e, or by name where npu-liger was installed from a wheel:\n"
            + "\n".join(lines))


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
