"""CTranslate2: the export of a checkpoint (``export``), the backend that decodes with it (``backend``)
and the metadata both read (``format``)."""
