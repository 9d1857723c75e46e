--[[
job_submit/lua doing the same rewrite as job_submit/coda, for bench/bench_submit.py.

For a job that asks for a GPU (tres_per_node or tres_per_job names "gpu") and carries
--comment=coda:workload=NAME, look NAME up in CPUS_PER_GPU and, when found, set
--cpus-per-gpu (cpus_per_tres = "gres:gpu:N", "gres/gpu:N" where Slurm spells it so), record the decision in admin_comment,
write one line to slurmctld's log and one line back to the user: the same work the
coda hook does for a job with a confident profile.

bench_submit.py copies this file beside the benchmark cluster's slurm.conf (Slurm reads
job_submit.lua from the directory of slurm.conf) and replaces the marker line below with
one entry per profile, so Lua looks up a table as large as coda's profile store.
--]]

local CPUS_PER_GPU = {
--@@CPUS_PER_GPU_ENTRIES@@
}

local function wants_gpu(tres)
	return tres ~= nil and string.find(tres, "gpu", 1, true) ~= nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	if not (wants_gpu(job_desc.tres_per_node) or wants_gpu(job_desc.tres_per_job)) then
		return slurm.SUCCESS
	end
	local comment = job_desc.comment
	if comment == nil then
		return slurm.SUCCESS
	end
	local name = string.match(comment, "coda:workload=([%w%._%+%-]+)")
	if name == nil then
		return slurm.SUCCESS
	end
	local cpg = CPUS_PER_GPU[name]
	if cpg == nil then
		return slurm.SUCCESS
	end
	local was = job_desc.cpus_per_tres or ""
	-- Slurm 23.11 and later spell a GRES gres/gpu, and refuse gres:gpu back.
	local gres = "gres:"
	if string.find((job_desc.tres_per_node or "") .. (job_desc.tres_per_job or ""), "gres/", 1, true) then
		gres = "gres/"
	end
	job_desc.cpus_per_tres = gres .. "gpu:" .. cpg
	local record = "coda:sig=workload:*:" .. name .. ";cpg=" .. cpg .. ";was=" .. was
		.. ";action=set;src=lua"
	if job_desc.admin_comment ~= nil then
		record = job_desc.admin_comment .. " " .. record
	end
	job_desc.admin_comment = record
	slurm.log_info("uid=%d name=%s sig=workload:*:%s action=set cpg=%d",
		submit_uid, tostring(job_desc.name), name, cpg)
	slurm.user_msg("coda: --cpus-per-gpu=" .. cpg .. " for workload " .. name .. " (lua table)")
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return slurm.SUCCESS
end

slurm.log_info("initialized")
return slurm.SUCCESS
