"""The ``orchestrator <command>`` tools around a job: the command table (``main``), what every command shares
(``common``), and the commands that live nowhere else (status, report, simulate)."""
