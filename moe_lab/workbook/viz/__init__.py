"""The teaching layer: matplotlib pictures and ipywidgets builders, imported only when used.

Every plot function returns a matplotlib Figure and takes an optional `ax`. Every widget builder uses
`continuous_update=False` and draws its default state at once, so a headless run still shows a figure.
`import moe_lab` never imports this package.
"""
