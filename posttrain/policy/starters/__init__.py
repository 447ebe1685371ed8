"""The embedded starter models: their recipes (``recipes``), names and cache
(``registry``), and the explicit build step (``build``: from scratch in ``scratch``, or
continued on an environment's episodes in ``episodes``), with the build's quality gate
(``gate``), its data from an environment's hooks (``hook_data``) and the order-id copy
circuit wired into a new model (``copy_circuit``)."""
