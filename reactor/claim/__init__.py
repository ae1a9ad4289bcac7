"""A job's timer and claim: the work queue every road offers jobs to, which arms one deadline
per job and hands the due ones this replica owns to the recorder, one claim per job at a time."""
