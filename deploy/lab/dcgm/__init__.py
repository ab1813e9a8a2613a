"""The lab's DCGM-exporter simulator: `python3 -m dcgm --port N --faults DIR --nodes a,b`."""
