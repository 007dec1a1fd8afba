"""Measuring tools: `specdec bench <command>`; each prints a table, saves JSON, adds a scoreboard row."""
