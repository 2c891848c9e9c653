"""The scripts the tests launch as processes (trainings, rank mains, scenarios): never collected by pytest."""
