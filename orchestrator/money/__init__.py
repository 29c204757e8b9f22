"""Money: the price catalog and cost meter, a job's cost report, budget alerts, and the spend index with its repair."""
