"""The learner's own numbers, kept for the instructor who grades a written answer.

Autograde clears a submission's outputs and runs it again on the grading machine, so the autograded
copy the Formgrader shows holds the grader's numbers, not the ones the learner's answer is about
("using your numbers": Day 11's written exercise). Cells tagged ``TAG`` in the source keep their
text outputs as the learner submitted them: ``KeepLearnerOutputs`` (first of the sanitize steps, before
nbgrader's ClearOutput) stores them in the cell's metadata, and ``ShowLearnerOutputs`` (after the run)
puts them in a markdown cell above the first written answer, where the grader reads them beside it.
"""

from __future__ import annotations

from nbgrader.preprocessors import NbGraderPreprocessor
from nbformat import NotebookNode
from nbformat.v4 import new_markdown_cell

TAG = "grader-sees-learner-output"
KEPT = "course_learner_outputs"   # the cell metadata key that carries them from sanitize to the autograded copy
SHOWN = "course_learner_outputs_shown"
HEADING = "**The learner's own numbers** (as they ran the notebook on their machine; the outputs above are the grading machine's)"


def _text(outputs: list) -> str:
    """What a reader sees of a cell's outputs, as text: streams and plain text (a plot is said, not drawn)."""
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif out.get("output_type") in ("execute_result", "display_data"):
            data = out.get("data", {})
            parts.append(data.get("text/plain", "") if "image/png" not in data else "(a plot)\n")
    return "".join(parts).strip()


class KeepLearnerOutputs(NbGraderPreprocessor):  # (nbgrader's base: enabled, where nbconvert's is off)
    """Store each tagged cell's outputs, as submitted, in its metadata (before ClearOutput removes them)."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and TAG in cell.metadata.get("tags", []):
            cell.metadata[KEPT] = _text(cell.get("outputs", []))
        return cell, resources


class ShowLearnerOutputs(NbGraderPreprocessor):
    """One markdown cell with every kept output, above the notebook's first written answer."""

    def preprocess(self, nb: NotebookNode, resources: dict):
        kept = [(cell.source.splitlines()[0] if cell.source else "", cell.metadata.pop(KEPT))
                for cell in nb.cells if KEPT in cell.metadata]
        answer = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
                       and c.metadata.get("nbgrader", {}).get("solution")), None)
        if not kept or answer is None:
            return nb, resources
        lines = [HEADING, ""]
        for first_line, text in kept:
            lines += [f"`{first_line}`", "", "```", text or "(no output: the learner did not run this cell)", "```", ""]
        cell = new_markdown_cell("\n".join(lines))
        cell.metadata[SHOWN] = True
        nb.cells.insert(answer, cell)
        return nb, resources
