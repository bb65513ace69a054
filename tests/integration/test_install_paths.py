"""The README's install commands, one per kind of machine: ``requirements.txt`` keeps whatever
torch a GPU runtime ships, ``requirements-cpu.txt`` gets PyTorch's CPU wheel on a machine without
an NVIDIA GPU.

PyTorch's CPU index (https://download.pytorch.org/whl/cpu) is not reachable from CI, so the
resolution test stands it in with two local PEP 503 indexes: one that plays PyPI (a plain
``torch-2.13.0`` wheel that requires a CUDA runtime package, as PyPI's Linux wheel does) and one
that plays PyTorch's CPU index (``torch-2.13.0+cpu``). pip resolves ``requirements-cpu.txt``'s
own lines, with only the index address swapped, against them.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _wheel(index: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A minimal installable wheel of ``name`` ``version`` in the PEP 503 index ``index``."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name.replace('-', '_')}/__init__.py": "",
             f"{dist}/METADATA": "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
                 name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)),
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).decode().rstrip('=')},"
                     f"{len(t.encode())}\n" for p, t in files.items()) + f"{dist}/RECORD,,\n"
    folder = index / name
    folder.mkdir(parents=True, exist_ok=True)
    wheel = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(folder / wheel, "w") as z:
        for p, t in {**files, f"{dist}/RECORD": record}.items():
            z.writestr(p, t)
    links = "".join(f'<a href="{w.name}">{w.name}</a>' for w in sorted(folder.glob("*.whl")))
    (folder / "index.html").write_text(f"<!DOCTYPE html><html><body>{links}</body></html>")  # the project's page


def _resolve(requirements: str, tmp_path: Path, pypi: Path) -> dict[str, str]:
    """``{name: version}`` pip would install for ``requirements`` from the local index ``pypi``
    (plus any index the requirements name), this machine's pip configuration left out."""
    req = tmp_path / "req.txt"
    req.write_text(requirements)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                    "--report", str(report), "--index-url", pypi.as_uri(), "-r", str(req)],
                   check=True, env=env, cwd=tmp_path, timeout=120)
    return {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}


def _cpu_lines() -> str:
    """``requirements-cpu.txt`` without its ``-r requirements.txt`` line (the course's other
    packages are not what this test resolves)."""
    text = (ROOT / "requirements-cpu.txt").read_text()
    return "\n".join(ln for ln in text.splitlines() if not ln.strip().startswith("-r")) + "\n"


def test_the_cpu_requirements_take_pytorchs_cpu_wheel_over_pypis(tmp_path):
    pypi, cpu = tmp_path / "pypi", tmp_path / "cpu"
    _wheel(pypi, "torch", "2.13.0", requires=("nvidia-cuda-runtime",))
    _wheel(pypi, "nvidia-cuda-runtime", "13.0.0")
    _wheel(cpu, "torch", "2.13.0+cpu")
    lines = _cpu_lines()
    assert CPU_INDEX in lines, f"requirements-cpu.txt no longer names {CPU_INDEX}"
    got = _resolve(lines.replace(CPU_INDEX, cpu.as_uri()), tmp_path, pypi)
    assert got == {"torch": "2.13.0+cpu"}, got
    # the control: the plain requirements' torch line alone takes PyPI's wheel and its CUDA runtime
    plain = _resolve("torch>=2.4\n", tmp_path, pypi)
    assert plain == {"torch": "2.13.0", "nvidia-cuda-runtime": "13.0.0"}, plain


def test_the_readme_gives_a_command_for_a_gpu_machine_and_one_for_a_cpu_laptop():
    readme = (ROOT / "README.md").read_text()
    cpu = (ROOT / "requirements-cpu.txt").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    assert any("pip install -r requirements.txt" in b and "requirements-cpu" not in b for b in blocks)
    assert any("pip install -r requirements-cpu.txt" in b for b in blocks), "the README has no CPU-laptop command"
    assert re.search(r"^-r requirements\.txt$", cpu, re.M), "requirements-cpu.txt must also install the course's packages"
    assert re.search(r"^torch\b", cpu, re.M)
