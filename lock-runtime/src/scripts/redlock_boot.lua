-- redlock_boot: create a Redlock master's boot marker, unless it has one.
--
-- Every master keeps one marker per key prefix, a hash without a TTL:
--   since  the master's clock (ms) when a runtime first found this data set
--   until  no new hold on this master before this time (= since: none)
--   lease  the longest TTL (ms) this master gave a hold since then
-- The marker lives as long as the master's data: a master restarted without
-- its data has none, a master restarted from its persistence files has the
-- one it had. acquire.lua checks it on every Redlock acquire.
--
-- A runtime runs this when it connects to a master whose marker it found
-- missing. Whether the master must be quarantined depends on the other
-- masters, which the runtime asked first: if none of them has recorded a
-- hold (a fresh fleet, or one never used under this prefix), the master
-- opens at once (ARGV[1] = 0); otherwise it lost its data, or is new to the
-- fleet, and takes no new hold for ARGV[1] ms.
--
-- KEYS[1]  the boot marker
-- ARGV[1]  quarantine in milliseconds (0: open at once)
-- ARGV[2]  the longest TTL in milliseconds the runtime knows any master gave
--
-- returns  {since, until, lease, created}: the marker as it is now, created
--          1 when this call created it
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local marker = redis.call('hmget', KEYS[1], 'since', 'until', 'lease')
if marker[1] and marker[2] then
  return {tonumber(marker[1]), tonumber(marker[2]), tonumber(marker[3] or '0'), 0}
end
local till = now + tonumber(ARGV[1])
redis.call('hset', KEYS[1], 'since', string.format('%.0f', now),
  'until', string.format('%.0f', till), 'lease', ARGV[2])
return {now, till, tonumber(ARGV[2]), 1}
