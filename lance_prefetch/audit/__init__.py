"""The coverage audit: each process's record of the rows it handed out (1 bit a row), the rule an
epoch's records are checked against, and the wiring that brings every rank's records together."""
