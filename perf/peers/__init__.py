"""Servers Shoal is compared with, each run as its own process by perf/knee.py."""
