"""Where a model is loaded: the repository on disk and its versions' states (``repository``),
loading and unloading them (``manager``), config.pbtxt parsed and auto-completed
(``config``), and each request checked against its model (``validation``)."""
