"""Timing shared by every stage: the GPU event timer behind a spin kernel (``gpu``), the timing policy
(``policy``) and the row schema of the step stages (``records``)."""
