"""What each of the grader's own processes does first: skip the IRI grammars jsonschema would build.

nbformat and nbgrader validate with jsonschema, and jsonschema's format checkers import
``rfc3987_syntax`` where it is installed (``jsonschema[format-nongpl]``, which Jupyter's packages ask
for). That module compiles about 35 Lark Earley parsers at import: 4.4 s in ``python -m grader check``'s
own process and 2.8 s in its worker on the 2-core CI machine (cProfile of lab 00's check), for the
``iri`` and ``iri-reference`` formats, which no schema the grader validates uses (nbformat's and
nbgrader's schemas name neither; the cost and its cause are python-jsonschema/jsonschema#1428
and jupyter-server/jupyter_server#1559). A ``None`` in ``sys.modules`` makes that import raise
ImportError (the import system's documented rule for ``None`` there), which jsonschema's
``_format`` catches: those two checkers are left out, nothing else changes.

Called by ``grader/__main__.py`` and ``grader/worker.py`` before they import nbformat. A module
already imported, or the GPL ``rfc3987`` package that jsonschema prefers, is left alone.
"""
from __future__ import annotations

import sys

SKIPPED = "rfc3987_syntax"


def skip_iri_grammars() -> None:
    sys.modules.setdefault(SKIPPED, None)
