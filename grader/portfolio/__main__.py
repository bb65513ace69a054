"""``python -m grader.portfolio``: the same as ``python -m grader report`` (:func:`grader.portfolio.main`)."""
import sys

from grader.portfolio import main

sys.exit(main())
