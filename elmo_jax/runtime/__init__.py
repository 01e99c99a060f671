"""Runtime helpers every room uses: logging, progress bars, devices, memory, local and bucket files,
and the run folder's layout (`run_layout`). No model or data code here."""
