use ironflow_core as _;
