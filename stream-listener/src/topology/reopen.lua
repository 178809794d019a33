-- Before a grow reuses shard index KEYS[1]: a shard a shrink retired (frozen: its last id is the largest
-- possible one; trimmed empty) is deleted, so that it can be created afresh. Anything else is left alone.
-- Returns 1 if it deleted the stream.
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('XLEN', KEYS[1]) ~= 0 then
  return 0
end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
for i = 1, #info, 2 do
  if info[i] == 'last-generated-id' and info[i + 1] == '18446744073709551615-18446744073709551615' then
    redis.call('DEL', KEYS[1])
    return 1
  end
end
return 0
