"""MLflow for one job: its run, resumed across attempts (``run``), and the buffered background delivery (``delivery``)."""
