"""A Dockerfile read instruction by instruction, each with what it does: lab 04 prints
``deploy/Dockerfile`` this way, so that the explanation follows the file when the file changes.

:func:`parse` splits the text into :class:`Instruction` s (continuation lines joined, the comment
block just above each kept, the build stage it belongs to); :func:`explain` says what one does,
from its keyword and arguments; :func:`describe` prints a whole file, stage by stage.

What the instructions do is the Dockerfile reference's (https://docs.docker.com/reference/dockerfile/):
``EXPOSE`` publishes nothing (``docker run -p`` does); a ``HEALTHCHECK`` runs every ``--interval``
(30 s by default), each run may take ``--timeout`` (30 s), ``--retries`` (3) failures in a row
make the container unhealthy, and failures during ``--start-period`` (0 s) do not count;
``HEALTHCHECK NONE`` turns off one inherited from the base image; ``CMD`` after an exec-form
``ENTRYPOINT`` gives its default arguments, which arguments given at run time replace. Kubernetes
maps a container's ``command`` to the image's ENTRYPOINT and its ``args`` to its CMD
(https://kubernetes.io/docs/tasks/inject-data-application/define-command-argument-container/).
The NVIDIA variables are the NVIDIA Container Toolkit's
(https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/docker-specialized.html);
``HF_HOME`` is huggingface_hub's cache root
(https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables), and
``VLLM_NO_USAGE_STATS=1`` vLLM's opt-out of usage statistics
(https://docs.vllm.ai/en/latest/serving/usage_stats.html).
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

# ENV names this module explains; any other is "set for later steps and the running container"
ENV_NOTES = {
    "NVIDIA_VISIBLE_DEVICES": "which GPUs the NVIDIA Container Runtime gives the container (all, indices or "
                              "UUIDs; `docker run --gpus` sets it for you)",
    "NVIDIA_DRIVER_CAPABILITIES": "which parts of the host's driver the toolkit mounts: `utility` is nvidia-smi "
                                  "and NVML, `compute` adds CUDA (unset: both)",
    "HOME": "the home directory, where tools keep their caches",
    "HF_HOME": "where Hugging Face libraries download models (a volume mounted there keeps them across restarts)",
    "VLLM_NO_USAGE_STATS": "vLLM sends no usage statistics",
    "PYTHONUNBUFFERED": "Python writes its output at once, so logs show as they happen",
    "PYTHONDONTWRITEBYTECODE": "Python writes no .pyc files",
}
# defaults of HEALTHCHECK's options (Dockerfile reference)
HEALTHCHECK_DEFAULTS = {"interval": "30s", "timeout": "30s", "start-period": "0s", "retries": "3"}


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, ...
    value: str  # the rest, continuation lines joined with one space
    stage: str  # the stage's name (FROM ... AS name), else "stage N"
    comment: str = ""  # the comment lines right above it, joined
    line: int = 0  # where it starts, 1-based

    def __str__(self) -> str:
        return f"{self.keyword} {self.value}".strip()


def parse(text: str) -> list[Instruction]:
    """The instructions of a Dockerfile, in order. Comment lines inside a continued instruction
    are dropped, as Docker drops them; a blank line or a divider ("# ----") ends a comment block."""
    out: list[Instruction] = []
    comment: list[str] = []
    stage, n_stages = "", 0
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        raw = lines[i].strip()
        start = i + 1
        i += 1
        if not raw:
            comment = []
            continue
        if raw.startswith("#"):
            body = raw.lstrip("#").strip()
            comment = [] if not body or set(body) <= set("-=*") else [*comment, body]
            continue
        parts = [raw]
        while parts[-1].endswith("\\") and i < len(lines):
            parts[-1] = parts[-1][:-1].rstrip()
            nxt = lines[i].strip()
            i += 1
            if nxt.startswith("#"):
                parts.append("\\")  # a comment line inside a continuation: skipped, the continuation goes on
                continue
            parts.append(nxt)
        joined = " ".join(p for p in parts if p and p != "\\").strip()
        keyword, _, value = joined.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            n_stages += 1
            m = re.search(r"\s+AS\s+(\S+)\s*$", value, re.I)
            stage = m.group(1) if m else f"stage {n_stages}"
        out.append(Instruction(keyword, value.strip(), stage or "stage 0", " ".join(comment), start))
        comment = []
    return out


def stages(instructions: list[Instruction]) -> dict[str, list[Instruction]]:
    """``{stage: its instructions}``, in the file's order."""
    out: dict[str, list[Instruction]] = {}
    for ins in instructions:
        out.setdefault(ins.stage, []).append(ins)
    return out


def exec_form(value: str) -> list[str] | None:
    """The JSON array of an exec-form instruction (``["vllm", "serve"]``), else None."""
    if not value.startswith("["):
        return None
    try:
        got = json.loads(value)
    except json.JSONDecodeError:
        return None
    return [str(x) for x in got] if isinstance(got, list) else None


def env_pairs(value: str) -> dict[str, str]:
    """``KEY=VALUE`` pairs of an ENV (or LABEL) instruction; the old ``ENV KEY VALUE`` form too."""
    words = shlex.split(value)
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    return dict(w.split("=", 1) for w in words if "=" in w)


def _from(value: str) -> str:
    image = value.split()[0]
    name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
    if "@sha256:" in image:
        pin = "pinned to a digest (the same bytes on every build)"
    elif tag and tag != "latest":
        pin = f"tag {tag}: pinned by name (a tag can be moved; a digest cannot)"
    else:
        pin = "not pinned: each build may get another image"
    what = f"starts a build stage from the image {name or image}, {pin}"
    if name.startswith("vllm/vllm-openai"):
        what += ("; vLLM's own image, built on NVIDIA's CUDA image (vLLM's docker/Dockerfile): CUDA's libraries, "
                 "PyTorch and vLLM, but no GPU driver, which the NVIDIA Container Toolkit mounts from the host "
                 "when the container starts")
    elif name.startswith("python") and "slim" in tag:
        what += "; a slim Python image, no CUDA in it"
    return what


def _run(value: str) -> str:
    steps = []
    for cmd in re.split(r"\s*&&\s*", value):
        words = cmd.split()
        if "pip" in words[:3] and "install" in words:
            pkgs = [w for w in words if not w.startswith("-") and w not in ("pip", "pip3", "install", "python", "-m")]
            pinned = [p for p in pkgs if "==" in p]
            what = f"installs Python packages ({', '.join(pinned)}, pinned)" if pinned else "installs Python packages"
            steps.append(what + (", keeping no download cache in the image" if "--no-cache-dir" in words else ""))
        elif words and words[0] == "useradd":
            uid = next((words[j + 1] for j, w in enumerate(words[:-1]) if w in ("--uid", "-u")), None)
            steps.append(f"creates the user {words[-1]}" + (f" with the fixed UID {uid}" if uid else ""))
        else:
            steps.append(f"runs `{cmd}`")
    return "at build time, in a new image layer: " + "; then ".join(steps)


def _healthcheck(value: str) -> str:
    if value.strip().upper() == "NONE":
        return "no health check, not even one inherited from the base image"
    opts = dict(HEALTHCHECK_DEFAULTS)
    opts.update(re.findall(r"--([\w-]+)=(\S+)", value.split(" CMD ")[0]))
    cmd = exec_form(value.partition("CMD")[2].strip())
    shown = " ".join(cmd) if cmd else value.partition("CMD")[2].strip()
    return (f"Docker runs `{shown[:90]}{'...' if len(shown) > 90 else ''}` every {opts['interval']} (each run at "
            f"most {opts['timeout']}); {opts['retries']} failures in a row mark the container unhealthy, and "
            f"failures in the first {opts['start-period']} do not count")


def explain(ins: Instruction, stage: list[Instruction] | None = None) -> str:
    """What ``ins`` does, in a sentence or two (``stage``: its stage's instructions, for CMD's
    relation to ENTRYPOINT)."""
    k, v = ins.keyword, ins.value
    if k == "FROM":
        return _from(v) + (f"; later stages and `docker build --target {ins.stage}` name it {ins.stage}"
                           if not ins.stage.startswith("stage ") else "")
    if k == "RUN":
        return _run(v)
    if k == "ENV":
        return "; ".join(f"{key}={val}: {ENV_NOTES.get(key, 'set for later steps and the running container')}"
                         for key, val in env_pairs(v).items())
    if k == "WORKDIR":
        return f"later instructions and the container's process start in {v} (created if missing)"
    if k in ("COPY", "ADD"):
        words = [w for w in v.split() if not w.startswith("--")]
        return f"copies {', '.join(words[:-1])} from the build context (the folder given to docker build) to {words[-1]}"
    if k == "USER":
        numeric = v.split(":")[0].isdigit()
        return (f"later instructions and the container's process run as {'UID ' if numeric else ''}{v}, not root"
                if v not in ("root", "0") else "runs as root")
    if k == "EXPOSE":
        return (f"records that the process listens on {v}; it publishes nothing: `docker run -p` or a Kubernetes "
                "containerPort and Service route traffic to it")
    if k == "HEALTHCHECK":
        return _healthcheck(v)
    if k == "ENTRYPOINT":
        argv = exec_form(v)
        return (f"the program the container runs: `{' '.join(argv) if argv else v}`; arguments follow it (CMD's, "
                "those given at run time, or a pod's args); a Kubernetes pod's `command` replaces it")
    if k == "CMD":
        argv = exec_form(v)
        shown = " ".join(argv) if argv else v
        if stage and any(i.keyword == "ENTRYPOINT" for i in stage):
            return (f"the default arguments after the ENTRYPOINT: `{shown}`; arguments given at run time "
                    "(`docker run IMAGE ARGS`, a Kubernetes pod's `args`) replace all of them")
        return f"the default command: `{shown}`; a command given at run time replaces it"
    if k == "ARG":
        return f"a build-time variable ({v}), not kept in the running container"
    if k == "LABEL":
        return f"metadata on the image: {v}"
    return f"{k}: see the Dockerfile reference"


def describe(text: str, only: tuple[str, ...] = ()) -> str:
    """Every instruction of the Dockerfile ``text`` (of the stages ``only``, if given), each
    followed by what it does and, where the file has one, its own comment."""
    out = []
    for name, instrs in stages(parse(text)).items():
        if only and name not in only:
            continue
        out.append(f"== stage {name}")
        for ins in instrs:
            shown = str(ins)
            out.append(shown if len(shown) <= 110 else shown[:107] + "...")
            out.append(f"    does:  {explain(ins, instrs)}")
            if ins.comment:
                out.append(f"    notes: {ins.comment}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"
