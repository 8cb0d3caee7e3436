"""What a user outside the repository meets first: the import errors, the license, a buildable package and
docs that never point outside the repository."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "TRITON_INTERPRET": "1"})


def test_import_without_triton_names_the_extra_per_backend():
    code = ("import sys; sys.modules['triton'] = None  # as if triton were not installed\n"
            "try:\n    import npu_liger\nexcept ImportError as e:\n    print(type(e).__name__, e)\n")
    out = _run_python(code).stdout
    assert out.startswith("ImportError npu_liger needs the `triton` module"), out
    for extra in ("cpu", "gpu", "npu"):
        assert f"pip install -e '.[{extra}]'" in out, out  # from a checkout
        assert f"pip install 'npu-liger[{extra}]'" in out, out  # an installed wheel: pip reads the extra from it


def test_interpreter_set_too_late_says_so():
    """TRITON_INTERPRET=1 set after triton (or npu_liger) was imported: the error says it came too late, not to set
    what is already set."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    scripts = {"after triton": "import os, triton\nos.environ['TRITON_INTERPRET'] = '1'\nimport npu_liger\n",
               "after npu_liger": "import os, torch, npu_liger\nos.environ['TRITON_INTERPRET'] = '1'\n"
                                  "npu_liger.geglu(torch.ones(3), torch.ones(3))\n"}
    for when, script in scripts.items():
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                                timeout=300)
        assert result.returncode != 0, when
        last = result.stderr.strip().splitlines()[-1]
        assert "too late" in last and "before anything imports triton" in last, (when, last)


def test_import_error_of_a_triton_dependency_is_not_disguised():
    """A module triton itself fails to find is reported as it is, not as 'install triton'."""
    code = ("import sys, importlib.abc\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name == 'triton':\n"
            "            raise ModuleNotFoundError(\"No module named 'some_dep'\", name='some_dep')\n"
            "sys.meta_path.insert(0, Block())\n"
            "try:\n    import npu_liger\nexcept ImportError as e:\n    print(e.name, e)\n")
    out = _run_python(code).stdout
    assert out.startswith("some_dep No module named 'some_dep'"), out


def test_transformers_import_error_gives_a_working_command():
    from npu_liger import _install

    assert "pip install 'transformers>=4.56'" in _install.TRANSFORMERS_HINT
    code = ("import sys; sys.modules['transformers'] = None\n"
            "import npu_liger.transformers as nlt\n"
            "try:\n    nlt.apply_npu_liger_to_llama()\nexcept ImportError as e:\n    print(e)\n")
    assert _run_python(code).stdout.strip() == _install.TRANSFORMERS_HINT


def _tracked_files():
    try:
        listed = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in listed.splitlines() if (ROOT / name).is_file()]


def test_license_keeps_liger_kernels_notice():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 2-Clause License")
    assert "Copyright 2024 LinkedIn Corporation" in text and "Liger-Kernel" in text
    assert text.count("Redistributions in binary form must reproduce") == 2  # ours and Liger-Kernel's
    assert "BSD 2-CLAUSE LICENSE\nCopyright 2024 LinkedIn Corporation \nAll Rights Reserved." in text  # verbatim
    assert 'license = { text = "BSD-2-Clause" }' in (ROOT / "pyproject.toml").read_text()


# Paths of the machines the project was developed on, and the old spec locations: none may appear in a file
# that ships.
OUTSIDE = re.compile(r"\.\./shared|shared/seed|shared/DESIGN|/work/")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_no_tracked_file_points_outside_the_repository():
    offenders = []
    for path in _tracked_files():
        if path.suffix not in (".py", ".md", ".sh", ".toml", ".txt", "") or path == Path(__file__).resolve():
            continue
        text = path.read_text(errors="replace")
        offenders += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in OUTSIDE.finditer(text)]
        if path.suffix == ".md":
            for target in MD_LINK.findall(text):
                if re.match(r"[a-z]+://", target):
                    continue  # a web address
                resolved = (path.parent / target).resolve()
                if not resolved.is_relative_to(ROOT) or not resolved.exists():
                    offenders.append(f"{path.relative_to(ROOT)}: broken or outside link {target}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("NPU_LIGER_TEST_DEVICE", "cpu") != "cpu",
                    reason="packaging is checked by the CPU run (the GPU copy of the tree is not a git checkout)")
def test_builds_a_wheel(tmp_path):
    """From the tracked files only (a copy, so the build leaves nothing in the checkout)."""
    import shutil

    source = tmp_path / "src"
    for path in _tracked_files():
        target = source / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                             "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    wheels = list(tmp_path.glob("npu_liger-*.whl"))
    assert len(wheels) == 1
    import zipfile

    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "npu_liger/npu_ops/tvd.py" in names and any(n.endswith("licenses/LICENSE") for n in names)
