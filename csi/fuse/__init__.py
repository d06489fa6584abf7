"""FUSE publishing mode: a file-level content-addressed store served read-only by pyfuse3.

The flow: ``images`` (reference → tree index; ordinary layers streamed through
``unpack``, eStargz layers indexed from their TOC by ``lazy``) fills ``filestore``
(each distinct file once) and saves an ``index`` per image manifest; ``fs`` serves
every index as a directory of one FUSE mount; ``session`` runs pyfuse3 on trio in a
thread on a /dev/fuse descriptor kept by the long-lived ``holder`` process, so the
daemon can restart under live volumes; ``publisher`` bind-mounts a tree's directory
read-only on a pod's target; ``service`` assembles them for the plugin.
"""
