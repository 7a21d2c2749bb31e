"""Autograding that warns about an edited test cell only: nbgrader's ``OverwriteCells``, silent about a
test cell the learner left as it was released.

nbgrader records each test cell in the gradebook with its hidden tests, and the student version has
none, so every untouched test cell that has hidden tests "has changed!" (its checksum) when it is
autograded: every submission warned about every such cell, and the warning said nothing (nbgrader
issue #1961). ``OverwriteCellsAsReleased`` gives such a cell its hidden tests back first; nbgrader's
``OverwriteCells`` then warns about, and restores, a cell the learner edited. The course's
``nbgrader_config.py`` sets ``SANITIZE_PREPROCESSORS``: nbgrader's own, with this one in its place.
"""

from __future__ import annotations

import copy

from nbgrader import utils
from nbgrader.api import MissingEntry
from nbgrader.preprocessors import (CheckCellMetadata, ClearHiddenTests, ClearOutput, DeduplicateIds, OverwriteCells,
                                    OverwriteKernelspec)


def released(cell):
    """``cell`` as the student version has it: its hidden tests cleared, as generate_assignment clears them."""
    cell, _ = ClearHiddenTests(enforce_metadata=False).preprocess_cell(copy.deepcopy(cell), {}, 0)
    return cell


class OverwriteCellsAsReleased(OverwriteCells):
    """``OverwriteCells``, after putting back the hidden tests of each test cell submitted as released."""

    def preprocess_cell(self, cell, resources, cell_index):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id is not None and utils.is_locked(cell):
            try:
                recorded = self.gradebook.find_source_cell(grade_id, self.notebook_id, self.assignment_id)
            except MissingEntry:  # (OverwriteCells says so)
                recorded = None
            if recorded is not None and recorded.source != cell.source:
                source = copy.deepcopy(cell)
                source.source = recorded.source
                if released(source).source == cell.source:
                    cell.source = recorded.source
        return super().preprocess_cell(cell, resources, cell_index)


# nbgrader's Autograde.sanitize_preprocessors (0.9.6), OverwriteCells replaced
SANITIZE_PREPROCESSORS = [ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCellsAsReleased, CheckCellMetadata]
