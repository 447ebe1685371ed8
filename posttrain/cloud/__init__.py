"""Running the recipes on a cloud GPU (Modal): ``modal_app`` is the Modal app, ``remote``
what it runs, which needs no Modal account and is tested on its own."""
