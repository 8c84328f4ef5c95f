"""`quantroll compare`: the reporting half (run directories -> summary.json, report.md/.html, plots).

Importing this package stays cheap: matplotlib is imported only when plots are drawn.
"""

from quantroll.compare.report import terminal_tables, write_report
from quantroll.compare.summary import RunData, load_runs, summarize

__all__ = ["RunData", "load_runs", "summarize", "write_report", "terminal_tables"]
