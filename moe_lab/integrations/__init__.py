"""moe-lab inside other libraries. Each module here imports its library; the core never imports them, and
`import moe_lab` imports none of those libraries.

- `moe_lab.integrations.transformers`: moe-lab as an experts implementation of transformers
  (`experts_implementation="moe_lab"`).
"""
