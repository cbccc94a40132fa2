"""The safe edit core: every file zdoctor changes is opened without following links, checked unchanged since
the preview, written beside it, backed up under a new name and renamed into place."""
