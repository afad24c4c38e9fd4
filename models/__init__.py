"""Built-in LightningModules and DataModules, addressable in experiment files by short name.

``BUILTIN_MODELS`` and ``BUILTIN_DATA`` map the names an experiment file may use in
``class_path`` to import paths; resolving them imports nothing until a class is needed.
"""

BUILTIN_MODELS = {
    "mlp": "hpsearch.models.mlp:MLPClassifier",
    "cnn": "hpsearch.models.cnn:CNNClassifier",
}

BUILTIN_DATA = {
    "digits": "hpsearch.models.digits:DigitsDataModule",
    "synthetic-images": "hpsearch.models.synthetic:SyntheticImagesDataModule",
    "image-folder": "hpsearch.models.image_folder:ImageFolderDataModule",
}

__all__ = ["BUILTIN_MODELS", "BUILTIN_DATA"]
