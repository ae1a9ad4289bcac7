"""Pure logic, no I/O and no database: time is passed in."""
