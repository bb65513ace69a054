"""utils/production/dockerfile.py: deploy/Dockerfile read instruction by instruction, every instruction of it
explained (none falls through to the generic line), the facts lab 04's text states about it true
of the file as it is, and the parser's rules (continuations, comments, forms) on small files."""
from __future__ import annotations

from pathlib import Path

from utils.production import dockerfile as D

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "deploy" / "Dockerfile").read_text()


def test_the_course_dockerfile_is_read_and_every_instruction_explained():
    stages = D.stages(D.parse(TEXT))
    assert list(stages) == ["exporter", "serve", "grade"]
    for name, instrs in stages.items():
        assert instrs[0].keyword == "FROM"
        for ins in instrs:
            said = D.explain(ins, instrs)
            assert said and "see the Dockerfile reference" not in said, (name, str(ins))
    out = D.describe(TEXT)
    assert out.count("== stage ") == 3 and "    does:  " in out and "    notes: " in out
    assert D.describe(TEXT, ("serve",)).count("== stage ") == 1


def test_what_lab_04_says_about_the_file_holds():
    """Section 7's text: serve runs `vllm serve` with default arguments in CMD and installs no CUDA
    or driver; the exporter asks the toolkit for every GPU and only the driver's utility part."""
    stages = D.stages(D.parse(TEXT))
    serve, exporter = stages["serve"], stages["exporter"]
    (entry,) = [i for i in serve if i.keyword == "ENTRYPOINT"]
    assert D.exec_form(entry.value) == ["vllm", "serve"]
    assert [i.keyword for i in serve].count("CMD") == 1
    assert serve[0].value.startswith("vllm/vllm-openai:")
    runs = " ".join(i.value.lower() for i in serve if i.keyword == "RUN")
    assert "cuda" not in runs and "driver" not in runs
    env = {k: v for i in exporter if i.keyword == "ENV" for k, v in D.env_pairs(i.value).items()}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_parser_rules():
    text = """# syntax note, not attached: a blank line follows

# --------
# base image
FROM python:3.12-slim AS app
RUN pip install a==1 \\
    # a comment inside the continuation is dropped
    && useradd --uid 7 app
ENV OLD value with spaces
ENV A=1 \\
    NVIDIA_VISIBLE_DEVICES=all
HEALTHCHECK CMD ["true"]
CMD ["python", "-m", "app"]
FROM scratch
USER root
FROBNICATE x
"""
    ins = D.parse(text)
    assert [i.keyword for i in ins] == ["FROM", "RUN", "ENV", "ENV", "HEALTHCHECK", "CMD", "FROM", "USER", "FROBNICATE"]
    assert ins[0].comment == "base image" and ins[0].stage == "app" and ins[0].line == 5
    assert ins[1].value == "pip install a==1 && useradd --uid 7 app"
    assert "a==1, pinned" in D.explain(ins[1]) and "UID 7" in D.explain(ins[1])
    assert D.env_pairs(ins[2].value) == {"OLD": "value with spaces"}
    assert D.env_pairs(ins[3].value) == {"A": "1", "NVIDIA_VISIBLE_DEVICES": "all"}
    assert "every 30s (each run at most 30s); 3 failures" in D.explain(ins[4])  # the reference's defaults
    assert D.explain(ins[5], ins[:6]).startswith("the default command")  # no ENTRYPOINT in the stage
    assert ins[6].stage == "stage 2" and "not pinned" in D.explain(ins[6])
    assert D.explain(ins[7]) == "runs as root" and "see the Dockerfile reference" in D.explain(ins[8])
    assert D.exec_form("[not json") is None and D.exec_form("python app.py") is None
