"""The node's one store of what is held: records of which presented volume holds which
content, shared by every presentation (bind, FUSE, git and http trees, the store volume).
"""
