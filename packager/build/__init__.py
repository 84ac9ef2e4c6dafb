"""The build job (`edgepack build`): a straight list of stage calls, one part at a time.

    job.py       build(): check the request, build each part, write the bundle, say the speed
    plan.py      the build's arguments as one request per part (PartRequest, ExportOptions)
    part.py      build_part(): one part's stages in order, each returning a small frozen record
    records.py   those records, the build's settings (BuildContext) and the part's precision
                 record with its manifest section (Precision.to_manifest)
    load.py      load/export the source; freeze constant inputs
    shape.py     static shapes, simplification, the part's task and precision plan
    data.py      the part's samples, loaded once: calibration and held-out sets
    measure.py   the FP32 reference, the precision decision, the providers' graphs, the speed
and the build-only helpers: part_shapes, fp32_graph, label_check, provider_choice,
provider_graphs.
"""
