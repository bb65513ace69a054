"""What a lab's notebook needs from the course: its setup cell, where it runs, its size tier and memory plan, and
one-line hints for unfinished exercises.

- ``bootstrap``: what each lab installs before it starts: the second half of every lab's setup cell.
- ``env``: where the notebook runs (Colab, Kaggle, local), smoke mode, and the size tier of the device.
- ``exercise_hints``: one line, not a traceback, when a cell fails only because an exercise above it is not done
  yet.
- ``lab_memory``: the terms a lab's peak GPU memory is estimated from, with ``utils.measure.memory``'s formulas:
  what a tier plan (``utils.course.tier_plan``) checks against a card.
- ``tier_plan``: the plan of each lab on each card: sizes, dtype, ``torch.compile``, what is skipped and why, and
  whether it fits the card's memory.
- ``notebook_lab``: which lab a notebook is: the one whose graded cells (nbgrader ``grade_id`` in each cell's
  metadata, https://nbgrader.readthedocs.io/en/stable/user_guide/creating_and_grading_assignments.html) it shares
  most with a reference notebook; failing that, the lab its file name starts with.
"""
