"""Dataset readers: ImageFolder directories and zip archives, text files, named datasets.

Import the concrete readers from their modules (``ghofl.data.images``, ``ghofl.data.text``,
``ghofl.data.registry``); importing this package has no side effects and imports no heavy
dependency.
"""
