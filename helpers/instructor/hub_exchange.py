"""nbgrader's collect for the hub (helpers.instructor.hub): a learner cannot submit as someone else.

Apart from helpers.instructor.hub so that the instructor's commands do not pay for importing nbgrader's exchange.
"""

import glob
import os
import pwd
from itertools import groupby

from nbgrader.exchange.default.collect import ExchangeCollect


class OwnerCheckedCollect(ExchangeCollect):
    """nbgrader's collect, but a submission whose files are not owned by the learner it names is
    skipped (nbgrader only logs a warning and collects it): nobody can submit as someone else."""

    def init_src(self):
        super().init_src()
        pattern = os.path.join(self.inbound_path, f"{self.coursedir.student_id or '*'}+{self.coursedir.assignment_id}+*")
        records = []
        for path in glob.glob(pattern):
            rec = self._path_to_record(path)
            try:
                owner = pwd.getpwuid(os.stat(path).st_uid).pw_name
            except KeyError:
                owner = None
            if owner != rec["username"]:
                self.log.error("Skipping %s: it claims to be %s's but belongs to %s", path, rec["username"], owner)
                continue
            records.append(rec)
        records.sort(key=lambda r: r["username"])
        self.src_records = [self._sort_by_timestamp(list(v))[0] for _, v in groupby(records, lambda r: r["username"])]
