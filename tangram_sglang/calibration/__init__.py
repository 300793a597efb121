"""Offline calibration: pilot data, the pilot runner, statistics and the regularity report."""
