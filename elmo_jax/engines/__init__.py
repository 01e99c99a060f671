"""A corpus on a cluster: the embed command's model step inside the engines that schedule, retry and move data
(Ray Data: `ray_data`, the ray extra; Apache Beam: `beam`, the beam extra), and what they share without an engine
(`corpus`, `worker`, `shard_files`)."""
