"""What every recipe group uses: the run folder's file names, command-line checks and errors, where local data lives."""
