"""Renderers: the terminal report, the Markdown, HTML and JSON exports, the progress line."""
