"""Run records: the store (``runs/runs.jsonl``), a job's record made from what its processes were seen doing, sweeps."""
