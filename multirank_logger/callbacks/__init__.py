"""Lightning callbacks that record into the run's store: DecisionAudit, StepTimer, StopOnAlert."""
