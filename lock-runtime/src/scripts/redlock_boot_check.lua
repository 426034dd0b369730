-- redlock_boot_check: the boot-marker check of a Redlock vote, prepended at
-- load to each vote script (acquire.lua by redis/scripts.rs, read.lua by
-- redlock/read.rs) so that it runs in the same call. Without KEYS[3] (one
-- Redis server, a cluster, a sentinel's primary) it does nothing.
--
-- Why: a master restarted without its data no longer knows the holds it
-- granted, while a holder whose majority counted this master relies on its
-- hold until the lease ends. Until then the master must vote for no new
-- holder, a reader included (Redlock's "delayed restart"). Runtimes create
-- the marker when they connect (redlock_boot.lua), so a marker missing here
-- means the data was lost: it is created now, quarantined for the caller's
-- quarantine. A caller that knows a longer lease (recorded on another
-- master's marker) stretches a restarted master's quarantine to it, for all
-- callers after it; a marker created open (until = since: a new fleet) is
-- never quarantined.
--
-- KEYS[3]  the boot marker        (hash: 'since', 'until', 'lease'; no TTL)
-- ARGV[2]  the lease asked, in milliseconds (the marker's 'lease' grows to it)
-- ARGV[5]  quarantine in milliseconds for a master found to have lost its data
-- ARGV[6]  the longest TTL in milliseconds the caller knows any master gave
-- ARGV[7]  '1': a retake by a holder that a majority just renewed
--
-- returns early {-1, left, 0, lease} (quarantined) or {-2, left, 0, lease}
-- (found just now); otherwise leaves the marker's 'lease' in `recorded` for
-- the vote script's reply, and lets it run.
local recorded
if KEYS[3] then
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local marker = redis.call('hmget', KEYS[3], 'since', 'until', 'lease')
  local since, till = tonumber(marker[1]), tonumber(marker[2])
  recorded = tonumber(marker[3]) or 0
  local found = since == nil or till == nil
  if found then
    since, till, recorded = now, now + tonumber(ARGV[5]), tonumber(ARGV[6])
    redis.call('hset', KEYS[3], 'since', string.format('%.0f', since),
      'until', string.format('%.0f', till), 'lease', string.format('%.0f', recorded))
  elseif till > since and since + tonumber(ARGV[5]) > till then
    till = since + tonumber(ARGV[5])
    redis.call('hset', KEYS[3], 'until', string.format('%.0f', till))
  end
  if now < till and ARGV[7] ~= '1' then
    if found then
      return {-2, till - now, 0, recorded}
    end
    return {-1, till - now, 0, recorded}
  end
  if recorded < tonumber(ARGV[2]) then
    recorded = tonumber(ARGV[2])
    redis.call('hset', KEYS[3], 'lease', ARGV[2])
  end
end
